//! What kind of failure a domain error is, said without HTTP (issue 40).
//!
//! Each subsystem's error type classifies itself with [`Classify`]; the one
//! mapping from a [`Kind`] to a status and a problem+json body is at the
//! edge (`impl<E: Classify> From<E> for ApiError` in `error.rs`). So a
//! service never names an HTTP type, and a new error variant is classified
//! where it is defined.

use serde_json::Value;

/// The kinds of failure a caller can act on.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// The request is malformed or a value is out of range.
    BadRequest,
    /// The named thing does not exist.
    NotFound,
    /// The caller may not do this here.
    Forbidden,
    /// The request conflicts with the current state; the value (an object,
    /// or null) is the state the caller needs to recover.
    Conflict(Value),
    /// A body or value is larger than allowed.
    TooLarge,
    /// Redis is unreachable or timed out: nothing was applied, or the
    /// outcome is unknown; retrying is safe.
    Unavailable,
    /// A bug or an unexpected reply.
    Internal,
}

/// A domain error that says what kind of failure it is; its `Display` is
/// the message for the caller.
pub trait Classify: std::fmt::Display {
    fn kind(&self) -> Kind;
}

/// The message a caller gets for `e`: its own, and for Redis being
/// unreachable, said so first.
pub(crate) fn detail<E: Classify>(e: &E) -> String {
    match e.kind() {
        Kind::Unavailable => format!("Redis is unavailable: {e}"),
        _ => e.to_string(),
    }
}

/// A value that breaks a bound: the message names the field and says how to
/// fix it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Invalid {
    #[error("{0}")]
    Value(String),
    /// A payload or value over its size limit.
    #[error("{0}")]
    TooLarge(String),
    /// Well formed, but names nothing there is (a path's message kind, a
    /// static asset): the caller asked for something that does not exist.
    #[error("{0}")]
    Unknown(String),
}

impl Invalid {
    pub fn new(msg: impl Into<String>) -> Self {
        Invalid::Value(msg.into())
    }
    /// The same refusal, its message prefixed with where it was found
    /// (`task \`a\`: ...`).
    pub fn within(self, place: &str) -> Self {
        match self {
            Invalid::Value(m) => Invalid::Value(format!("{place}: {m}")),
            Invalid::TooLarge(m) => Invalid::TooLarge(format!("{place}: {m}")),
            Invalid::Unknown(m) => Invalid::Unknown(format!("{place}: {m}")),
        }
    }
}

impl Classify for Invalid {
    fn kind(&self) -> Kind {
        match self {
            Invalid::Value(_) => Kind::BadRequest,
            Invalid::TooLarge(_) => Kind::TooLarge,
            Invalid::Unknown(_) => Kind::NotFound,
        }
    }
}

impl Classify for crate::store::StoreError {
    fn kind(&self) -> Kind {
        match self {
            crate::store::StoreError::Unavailable(_) => Kind::Unavailable,
            _ => Kind::Internal,
        }
    }
}
