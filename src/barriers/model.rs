//! What the barrier service reads and returns: rounds and their verdicts,
//! holds, DoubleBarriers, and its errors.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::ToSchema;

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

/// A round's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Not decided yet (or the caller's `wait_ms` ran out first).
    Pending,
    /// The participants that arrived before the decision may run.
    Released,
    /// Nobody runs this round.
    Aborted,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Pending => "pending",
            Verdict::Released => "released",
            Verdict::Aborted => "aborted",
        }
    }

    fn parse(s: &str) -> Verdict {
        match s {
            "released" => Verdict::Released,
            "aborted" => Verdict::Aborted,
            _ => Verdict::Pending,
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A barrier's configuration.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BarrierConfigView {
    pub name: String,
    /// Node ids that take part in every round.
    pub participants: Vec<String>,
    /// How many participants may be missing at the deadline for the round to
    /// be released anyway.
    pub max_missing: u32,
    /// A round's deadline, counted from its first arrival.
    pub timeout_ms: u64,
    /// Redis ms.
    pub updated_at: i64,
    pub updated_by: String,
}

/// One participant's arrival.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Arrival {
    pub node: String,
    /// Redis ms.
    pub at: i64,
}

/// One round as stored.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Round {
    pub barrier: String,
    pub round: String,
    pub verdict: Verdict,
    /// The participants of this round (the barrier's, when it opened).
    pub participants: Vec<String>,
    pub max_missing: u32,
    pub timeout_ms: u64,
    /// Redis ms of the first arrival.
    pub opened_at: i64,
    /// Redis ms.
    pub deadline: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<i64>,
    /// `all_arrived` or `deadline`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Participants that arrived before the verdict, in arrival order.
    pub arrived: Vec<String>,
    /// Participants that had not arrived (before the verdict, or yet).
    pub missing: Vec<String>,
    /// Arrivals before the verdict with their times.
    pub arrivals: Vec<Arrival>,
    /// Arrivals after the verdict.
    pub late: Vec<Arrival>,
    /// Which incarnation of the round id this is (its `opened_id`, or its
    /// opening time for rounds stored before that field existed).
    #[serde(skip)]
    pub incarnation: String,
}

impl Round {
    /// The arrival time of `node` before the verdict, if it arrived.
    pub fn arrived_at(&self, node: &str) -> Option<i64> {
        self.arrivals.iter().find(|a| a.node == node).map(|a| a.at)
    }

    pub fn is_open(&self) -> bool {
        self.verdict == Verdict::Pending
    }
}

/// What an arrival returned.
#[derive(Debug, Clone)]
pub struct ArriveOutcome {
    pub round: Round,
    /// The verdict this call set, if it decided the round.
    pub decided_now: Option<Verdict>,
    /// Redis ms at the call.
    pub now: i64,
}

/// An etcd-style hold.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Hold {
    pub barrier: String,
    pub held: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_at: Option<i64>,
    /// Redis ms when the hold lifts itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

/// A DoubleBarrier's state.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DoubleBarrier {
    pub name: String,
    /// Entrants that make it ready; 0 when nobody is in.
    pub count: u32,
    /// Entrants in, with their entry time (Redis ms), in entry order.
    pub entrants: Vec<Arrival>,
    /// Whether the count was reached (until everyone has left).
    pub ready: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<i64>,
    /// Identifies the ready cycle (the stream id of its `dbarrier.ready` event).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycle: Option<String>,
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
    let incarnation = match m.get("opened_id") {
        Some(id) => id.clone(),
        None => format!("t{}", num("opened_at").unwrap_or(0)),
    };
    Some(Round {
        barrier: barrier.into(),
        round: round.into(),
        verdict: Verdict::parse(m.get("verdict").map(String::as_str).unwrap_or("")),
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
        incarnation,
    })
}
