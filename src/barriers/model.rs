//! What the barrier service reads and returns: rounds and their verdicts,
//! holds, DoubleBarriers (the wire types, from `muster_api::barriers`), what
//! its scripts answered, and its errors.

use std::collections::BTreeMap;

pub(crate) use muster_api::barriers::{Arrival, BarrierConfigView, DoubleBarrier, Hold, Round, Verdict};

use crate::problem::{Classify, Kind};
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum BarrierError {
    #[error("no barrier `{0}`: configure it with PUT /api/v1/barriers/{0}")]
    NotFound(String),
    #[error("no round `{round}` of barrier `{barrier}` (it may have passed its retention)")]
    RoundNotFound { barrier: String, round: String },
    #[error("`{node}` is not a participant of round `{round}` of barrier `{barrier}`")]
    NotParticipant {
        barrier: String,
        round: String,
        node: String,
    },
    #[error(
        "the cluster already has the maximum of {0} barriers (barriers.max_barriers, counted per shard when redis.shards > 1): delete one or raise the limit"
    )]
    TooMany(u32),
    #[error(
        "barrier `{barrier}` already has {max} undecided rounds (barriers.max_open_rounds): arrive at an open round, or wait until one is decided"
    )]
    TooManyOpenRounds { barrier: String, max: u32 },
    #[error("barrier `{barrier}` is held by `{holder}`")]
    HeldByOther { barrier: String, holder: String },
    #[error(
        "DoubleBarrier `{name}` is full: {count} entrants are in (or have not all left yet); wait until they leave"
    )]
    TooManyEntrants { name: String, count: u32 },
    #[error("DoubleBarrier `{name}` has count {count}; every entrant must use the same count")]
    CountMismatch { name: String, count: u32 },
    #[error(
        "node `{0}` is not registered or its heartbeat expired: PUT /api/v1/nodes/{0}/heartbeat first, and keep heartbeating while inside"
    )]
    NodeNotAlive(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl Classify for BarrierError {
    fn kind(&self) -> Kind {
        use serde_json::json;
        match self {
            BarrierError::NotFound(_) | BarrierError::RoundNotFound { .. } => Kind::NotFound,
            BarrierError::NotParticipant { .. } => Kind::Forbidden,
            BarrierError::HeldByOther { holder, .. } => Kind::Conflict(json!({"holder": holder})),
            BarrierError::TooManyEntrants { count, .. } => {
                Kind::Conflict(json!({"reason": "too_many", "count": count}))
            }
            BarrierError::CountMismatch { count, .. } => {
                Kind::Conflict(json!({"reason": "count_mismatch", "count": count}))
            }
            BarrierError::TooManyOpenRounds { max, .. } => {
                Kind::Conflict(json!({"reason": "too_many_open_rounds", "max_open_rounds": max}))
            }
            BarrierError::TooMany(_) | BarrierError::NodeNotAlive(_) => Kind::Conflict(json!(null)),
            BarrierError::Store(s) => s.kind(),
        }
    }
}

/// The verdict stored in a round's hash; anything else (no verdict yet) is
/// pending.
pub(super) fn verdict_of(s: &str) -> Verdict {
    match s {
        "released" => Verdict::Released,
        "aborted" => Verdict::Aborted,
        _ => Verdict::Pending,
    }
}

/// What an arrival returned.
#[derive(Debug, Clone)]
pub struct ArriveOutcome {
    pub round: Round,
    /// Which incarnation of the round id it is (see [`incarnation_of`]).
    pub incarnation: String,
    /// The verdict this call set, if it decided the round.
    pub decided_now: Option<Verdict>,
    /// Redis ms at the call.
    pub now: i64,
}

/// What an enter returned.
#[derive(Debug, Clone)]
pub struct Entered {
    pub entered_now: bool,
    pub count: u32,
    pub entrants: u32,
    pub ready_at: Option<i64>,
}

/// What a leave returned.
#[derive(Debug, Clone)]
pub struct Left {
    pub left_now: bool,
    pub entrants: u32,
    /// The ready cycle the caller must see emptied; None when the barrier was
    /// not ready (nobody needs to wait).
    pub cycle: Option<String>,
}

/// `",a,b,"` into `[a, b]`.
pub(super) fn split_parts(parts: &str) -> Vec<String> {
    parts.split(',').filter(|p| !p.is_empty()).map(str::to_string).collect()
}

/// Which incarnation of the round id a round's hash is: its `opened_id`, or
/// its opening time for rounds stored before that field existed. Server-side
/// only: not part of the round on the wire.
pub(crate) fn incarnation_of(m: &BTreeMap<String, String>) -> String {
    match m.get("opened_id") {
        Some(id) => id.clone(),
        None => format!(
            "t{}",
            m.get("opened_at").and_then(|v| v.parse::<i64>().ok()).unwrap_or(0)
        ),
    }
}

/// Builds a round from its hash; None when the hash is empty (gone).
pub(crate) fn round_from(barrier: &str, round: &str, m: &BTreeMap<String, String>) -> Option<Round> {
    if !m.contains_key("parts") {
        return None;
    }
    let num = |f: &str| m.get(f).and_then(|v| v.parse::<i64>().ok());
    let participants = split_parts(m.get("parts").map(String::as_str).unwrap_or(""));
    let mut arrivals = Vec::new();
    let mut late = Vec::new();
    for (k, v) in m {
        let at = v.parse().unwrap_or(0);
        if let Some(node) = k.strip_prefix("a:") {
            arrivals.push(Arrival { node: node.into(), at });
        } else if let Some(node) = k.strip_prefix("l:") {
            late.push(Arrival { node: node.into(), at });
        }
    }
    arrivals.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.node.cmp(&b.node)));
    late.sort_by(|a, b| a.at.cmp(&b.at).then_with(|| a.node.cmp(&b.node)));
    let arrived: Vec<String> = arrivals.iter().map(|a| a.node.clone()).collect();
    let missing = participants.iter().filter(|p| !arrived.contains(p)).cloned().collect();
    Some(Round {
        barrier: barrier.into(),
        round: round.into(),
        verdict: verdict_of(m.get("verdict").map(String::as_str).unwrap_or("")),
        max_missing: num("max_missing").unwrap_or(0) as u32,
        timeout_ms: num("timeout_ms").unwrap_or(0) as u64,
        opened_at: num("opened_at").unwrap_or(0),
        deadline: num("deadline").unwrap_or(0),
        decided_at: num("decided_at"),
        reason: m.get("reason").cloned(),
        participants,
        arrived,
        missing,
        arrivals,
        late,
    })
}
