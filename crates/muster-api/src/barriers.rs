//! Barriers (rounds, holds, double barriers) on the wire.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// A round's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A barrier's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Arrival {
    pub node: String,
    /// Redis ms.
    pub at: i64,
}

/// One round as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// An etcd-style hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BarrierList {
    /// Barriers configured with PUT, by name.
    pub barriers: Vec<BarrierConfigView>,
    /// Every etcd-style hold in force, by barrier name, whether that barrier
    /// is configured or not (at most 1000).
    pub holds: Vec<Hold>,
}

/// One barrier: its configuration, if it was configured with PUT, and its
/// etcd-style hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BarrierDetail {
    pub name: String,
    /// Whether the barrier was configured with PUT (and so has rounds). A
    /// barrier that is only held (etcd-style) has `configured: false` and
    /// none of the configuration fields.
    pub configured: bool,
    /// Node ids that take part in every round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub participants: Option<Vec<String>>,
    /// How many participants may be missing at the deadline for the round to
    /// be released anyway.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_missing: Option<u32>,
    /// A round's deadline, counted from its first arrival.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Redis ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_by: Option<String>,
    /// The etcd-style hold of the same name.
    pub hold: Hold,
}

impl BarrierDetail {
    /// The detail of barrier `name`: its configuration's fields when it has
    /// one, and its hold.
    pub fn new(name: String, config: Option<BarrierConfigView>, hold: Hold) -> Self {
        let configured = config.is_some();
        let (participants, max_missing, timeout_ms, updated_at, updated_by) = match config {
            Some(c) => (
                Some(c.participants),
                Some(c.max_missing),
                Some(c.timeout_ms),
                Some(c.updated_at),
                Some(c.updated_by),
            ),
            None => (None, None, None, None, None),
        };
        BarrierDetail {
            name,
            configured,
            participants,
            max_missing,
            timeout_ms,
            updated_at,
            updated_by,
            hold,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RoundList {
    /// Newest first.
    pub rounds: Vec<Round>,
}

/// A participant's view of a round (serialized from the shared round, not
/// copied: every waiter of a round answers at once).
// The server borrows the strings and lists from the round it shares between
// the waiters of one node; a client reads an owned `ArriveResponse<'static>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ArriveResponse<'a> {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub barrier: Cow<'a, str>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub round: Cow<'a, str>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub node: Cow<'a, str>,
    /// `pending` when `wait_ms` ran out before the decision.
    pub verdict: Verdict,
    /// True only for a participant that arrived before a `released` verdict.
    pub may_run: bool,
    /// The participant arrived after the verdict.
    pub late: bool,
    /// Participants that arrived before the verdict, in arrival order.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub arrived: Cow<'a, [String]>,
    /// Participants that had not arrived before the verdict (or yet): the
    /// lost ones, whose work may be reassigned.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub missing: Cow<'a, [String]>,
    /// Redis ms of this participant's arrival before the verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arrived_at: Option<i64>,
    /// The participants of this round.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub participants: Cow<'a, [String]>,
    pub max_missing: u32,
    /// Redis ms.
    pub opened_at: i64,
    pub deadline: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Released {
    /// Whether the barrier was held.
    pub released: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DoubleBarrierList {
    pub double_barriers: Vec<DoubleBarrier>,
}

/// A DoubleBarrier as one entrant sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DoubleBarrierReply {
    #[serde(flatten)]
    pub state: DoubleBarrier,
    pub node: String,
    /// Whether `node` is among the entrants.
    pub inside: bool,
    /// enter: the barrier is ready and `node` is inside. leave: every entrant
    /// of the cycle has left (or there was nothing to wait for).
    pub done: bool,
}
