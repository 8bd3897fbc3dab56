//! Validation of every user-supplied name that becomes part of a Redis key.
//!
//! Names are checked before any key is built from them, so a key can never
//! contain a brace (which would change its Cluster hash slot), a colon (which
//! would let one name impersonate another key's structure) or whitespace.
//! Names also become URL path segments (`/api/v1/queues/{queue}`, dashboard
//! links), so `.` and `..` are refused: clients remove such dot segments
//! (RFC 3986, section 5.2.4), and a thing named so could never be addressed.

use std::ops::RangeInclusive;

use crate::problem::Invalid;

// The bounds below are the single source of both the checks in handlers and
// the OpenAPI document (`crate::openapi` writes them into the schemas), so
// the two cannot drift apart.

/// Longest queue, group, alias, barrier, lock, election or schedule name.
pub const NAME_MAX_LEN: usize = 128;
/// Longest node or worker id.
pub const NODE_ID_MAX_LEN: usize = 64;
/// Task and workflow ids: 26 ASCII letters and digits (ULIDs).
pub const ID_LEN: usize = 26;
/// Longest idempotency key, lock owner, candidate or holder.
pub const OPAQUE_KEY_MAX_LEN: usize = 200;

/// `limit` of task listings (a queue's tasks, dead tasks).
pub const TASK_PAGE_LIMIT: RangeInclusive<usize> = 1..=500;
/// Deepest `cursor` of a task listing.
pub const TASK_CURSOR_MAX: usize = 1_000_000;
/// `limit` of the workflow listing.
pub const WORKFLOW_PAGE_LIMIT: RangeInclusive<usize> = 1..=200;
/// `limit` of the orphan report, the event replay and a barrier's rounds.
pub const LONG_PAGE_LIMIT: RangeInclusive<usize> = 1..=1000;
/// `history` entries of one schedule.
pub const SCHEDULE_HISTORY: RangeInclusive<usize> = 0..=1000;
/// Tasks claimed by one call (`max`, `next.max`).
pub const CLAIM_MAX: RangeInclusive<u32> = 1..=1000;
/// Longest long poll of a claim (`wait_ms`, `next.wait_ms`).
pub const CLAIM_WAIT_MAX_MS: u64 = 30_000;
/// A claim's lease (`ack_ms`, `next.ack_ms`, `claim.ack_ms` unless 0): how
/// long a claimed task may go unacknowledged.
pub const CLAIM_ACK_MS: RangeInclusive<u64> = 1_000..=600_000;
/// Items of a batch submit or a batch complete.
pub const BATCH_ITEMS: RangeInclusive<usize> = 1..=1000;
/// Participants of a barrier.
pub const PARTICIPANTS: RangeInclusive<usize> = 1..=1000;
/// A barrier round's `timeout_ms`: 10 ms to 24 h.
pub const ROUND_TIMEOUT_MS: RangeInclusive<u64> = 10..=86_400_000;
/// A DoubleBarrier's `count`.
pub const DOUBLE_BARRIER_COUNT: RangeInclusive<u32> = 1..=1000;
/// Shortest lease of a lock, an election or a hold (the longest is in config).
pub const MIN_LEASE_MS: u64 = 100;
/// A group's concurrency `limit`.
pub const GROUP_LIMIT: RangeInclusive<u32> = 1..=100_000;
/// A task heartbeat's `progress`.
pub const PROGRESS: RangeInclusive<u8> = 0..=100;
/// An external worker's heartbeat `ttl_ms`.
pub const WORKER_TTL_MS: RangeInclusive<u64> = 500..=3_600_000;
/// An external worker's labels: how many, and the longest key and value.
pub const WORKER_LABELS_MAX: usize = 32;
pub const WORKER_LABEL_KEY_MAX_LEN: usize = 64;
pub const WORKER_LABEL_VALUE_MAX_LEN: usize = 256;
/// An external worker's `addr` and `version`.
pub const WORKER_ADDR_MAX_LEN: usize = 256;
pub const WORKER_VERSION_MAX_LEN: usize = 64;
/// A task's `priority`.
pub const PRIORITY: RangeInclusive<i32> = -1000..=1000;
/// A task's `max_attempts`.
pub const MAX_ATTEMPTS: RangeInclusive<u32> = 1..=1000;
/// A task's longest `timeout_ms`: 7 days.
pub const TASK_TIMEOUT_MAX_MS: u64 = 7 * 24 * 3600 * 1000;
/// Longest retry backoff (`backoff_base_ms`, `backoff_cap_ms`): 24 h.
pub const BACKOFF_MAX_MS: u64 = 24 * 3600 * 1000;
/// A schedule's `starting_deadline_ms`: 1 s to 7 days.
pub const STARTING_DEADLINE_MS: RangeInclusive<u64> = 1000..=7 * 24 * 3600 * 1000;
/// A schedule's cron `expression`: 1 to 256 characters.
pub const EXPRESSION_LEN: RangeInclusive<usize> = 1..=256;
/// A schedule's `timezone` (an IANA name, the longest is 32): 1 to 64 characters.
pub const TIMEZONE_LEN: RangeInclusive<usize> = 1..=64;
/// An event filter's `topics`: at most 32 comma-separated parts, each at
/// most 64 characters.
pub const TOPICS_MAX: usize = 32;
pub const TOPIC_MAX_LEN: usize = 64;

/// The JSON Schema pattern of a name: the charset, not `.` or `..`
/// (ECMA-262 without lookaround, which some schema tools cannot run).
pub fn name_pattern(max: usize) -> String {
    format!(
        "^([A-Za-z0-9_-][A-Za-z0-9._-]{{0,{}}}|\\.[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{}}}|\\.\\.[A-Za-z0-9._-]{{1,{}}})$",
        max - 1,
        max - 2,
        max - 2
    )
}

/// The JSON Schema pattern of a task or workflow id.
pub fn id_pattern() -> String {
    format!("^[A-Za-z0-9]{{{ID_LEN}}}$")
}

/// The JSON Schema pattern of an opaque key: printable ASCII, no spaces.
pub fn opaque_key_pattern() -> String {
    format!("^[!-~]{{1,{OPAQUE_KEY_MAX_LEN}}}$")
}

fn charset_ok(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// `.` and `..`: path segments that URL clients remove.
fn dot_segment(s: &str) -> bool {
    s == "." || s == ".."
}

/// Node ids: `[A-Za-z0-9._-]{1,64}`, not `.` or `..`.
pub fn is_node_id(s: &str) -> bool {
    (1..=NODE_ID_MAX_LEN).contains(&s.len()) && charset_ok(s) && !dot_segment(s)
}

/// Queue, group, alias, barrier, lock and schedule names:
/// `[A-Za-z0-9._-]{1,128}`, not `.` or `..`.
pub fn is_name(s: &str) -> bool {
    (1..=NAME_MAX_LEN).contains(&s.len()) && charset_ok(s) && !dot_segment(s)
}

/// The 400 for a name that is only dots.
fn dot_segment_error(field: &str, value: &str) -> Invalid {
    Invalid::new(format!(
        "`{field}` cannot be {value:?}: URLs drop `.` and `..` path segments, so it could not be addressed; \
         pick a name with another character"
    ))
}

/// Returns a 400 naming the field when `value` is not a valid node id.
pub fn node_id(field: &str, value: &str) -> Result<(), Invalid> {
    if is_node_id(value) {
        Ok(())
    } else if dot_segment(value) {
        Err(dot_segment_error(field, value))
    } else {
        Err(Invalid::new(format!(
            "`{field}` must be 1 to {NODE_ID_MAX_LEN} characters from A-Z a-z 0-9 . _ - (got {})",
            shorten(value)
        )))
    }
}

/// Returns a 400 naming the field when `value` is not a valid name.
pub fn name(field: &str, value: &str) -> Result<(), Invalid> {
    if is_name(value) {
        Ok(())
    } else if dot_segment(value) {
        Err(dot_segment_error(field, value))
    } else {
        Err(Invalid::new(format!(
            "`{field}` must be 1 to {NAME_MAX_LEN} characters from A-Z a-z 0-9 . _ - (got {})",
            shorten(value)
        )))
    }
}

/// Idempotency keys and similar opaque tokens: 1 to 200 printable ASCII characters.
pub fn opaque_key(field: &str, value: &str) -> Result<(), Invalid> {
    if (1..=OPAQUE_KEY_MAX_LEN).contains(&value.len()) && value.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        Ok(())
    } else {
        Err(Invalid::new(format!(
            "`{field}` must be 1 to {OPAQUE_KEY_MAX_LEN} printable ASCII characters without spaces"
        )))
    }
}

/// A control character (C0, DEL, C1) or a bidirectional formatting
/// character (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069):
/// refused in free text that is shown to people (a worker's labels, `addr`
/// and `version`), where a line break forges lines and U+202E reorders
/// what a page shows.
pub fn is_hidden_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// The JSON Schema pattern of free text: no control or bidi characters
/// (see [`is_hidden_char`]).
pub fn plain_text_pattern() -> String {
    "^[^\\u0000-\\u001F\\u007F-\\u009F\\u061C\\u200E\\u200F\\u202A-\\u202E\\u2066-\\u2069]*$".to_string()
}

/// Returns a 400 naming the field when `value` has a control or bidi
/// character (`field` names it, e.g. "`labels` key \"a\"").
pub fn plain_text(field: &str, value: &str) -> Result<(), Invalid> {
    match value.chars().position(is_hidden_char) {
        None => Ok(()),
        Some(i) => {
            let c = value.chars().nth(i).unwrap_or_default();
            Err(Invalid::new(format!(
                "{field} may not contain control or bidirectional formatting characters (U+{:04X} at character {}, in {})",
                c as u32,
                i + 1,
                shorten(value)
            )))
        }
    }
}

/// Returns a 400 naming the field when `value` is not a task or workflow
/// id (`what`: "task", "workflow").
pub fn id(what: &str, value: &str) -> Result<(), Invalid> {
    if value.len() == ID_LEN && value.bytes().all(|b| b.is_ascii_alphanumeric()) {
        Ok(())
    } else {
        Err(Invalid::new(format!(
            "`id` must be a {ID_LEN}-character {what} id (got {})",
            shorten(value)
        )))
    }
}

/// Returns a 400 naming the field unless `range` holds `value`.
pub fn in_range<T: PartialOrd + std::fmt::Display>(
    field: &str,
    value: T,
    range: &RangeInclusive<T>,
) -> Result<(), Invalid> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(Invalid::new(format!(
            "`{field}` must be between {} and {}",
            range.start(),
            range.end()
        )))
    }
}

/// Implements `Deserialize` for a request body struct that derives it with
/// `#[serde(remote = "Self")]`, taking a JSON object only: serde's derive
/// also reads a struct from an array of its fields in order, so a body of
/// all-optional fields would take `[null, null]`.
macro_rules! object_only {
    ($t:ty) => {
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let fields = serde_json::Map::<String, serde_json::Value>::deserialize(d)?;
                // Through `lenient`: `4197.0` is an integer here too.
                let value = $crate::lenient::value(serde_json::Value::Object(fields));
                let mut track = serde_path_to_error::Track::new();
                let tracked = serde_path_to_error::Deserializer::new(value, &mut track);
                <$t>::deserialize(tracked)
                    .map_err(|e| serde::de::Error::custom(serde_path_to_error::Error::new(track.path(), e)))
            }
        }
    };
}
pub(crate) use object_only;

/// Quotes a value for an error message, cut to a readable length.
pub fn shorten(value: &str) -> String {
    let cut: String = value.chars().take(40).collect();
    if cut.len() < value.len() {
        format!("{cut:?}...")
    } else {
        format!("{cut:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_name("emails.high-prio_1"));
        assert!(!is_name(""));
        assert!(!is_name("a:b"));
        assert!(!is_name("{x}"));
        assert!(!is_name("a b"));
        assert!(!is_name(&"a".repeat(129)));
        assert!(is_name(&"a".repeat(128)));
        assert!(is_node_id(&"n".repeat(64)));
        assert!(!is_node_id(&"n".repeat(65)));
    }

    #[test]
    fn plain_text_refuses_control_and_bidi_characters() {
        for bad in [
            "\0",
            "a\u{1}",
            "a\nb",
            "\r\n",
            "\u{7f}",
            "\u{85}",
            "a\u{202e}b",
            "\u{2066}",
            "\u{200f}",
            "\u{61c}",
        ] {
            let msg = plain_text("`addr`", bad).unwrap_err().to_string();
            assert!(msg.contains("`addr` may not contain"), "{bad:?}: {msg}");
        }
        for good in [
            "",
            "host:8080",
            "v1.2.3 (linux)",
            "zürich",
            "日本",
            "emoji 🚀",
            "tab-free\u{200d}",
        ] {
            plain_text("`addr`", good).unwrap();
        }
        let re = plain_text_pattern();
        assert!(re.starts_with("^[^\\u0000-\\u001F") && re.ends_with("]*$"), "{re}");
    }

    #[test]
    fn dot_segments_are_not_names() {
        for v in [".", ".."] {
            assert!(!is_name(v) && !is_node_id(v), "{v}");
            let msg = name("queue", v).unwrap_err().to_string();
            assert!(
                msg.contains("`queue` cannot be") && msg.contains("path segments"),
                "{msg}"
            );
            assert!(node_id("node", v).unwrap_err().to_string().contains("`node` cannot be"));
        }
        for v in ["...", ".a", "a.", "..b", "a..b"] {
            assert!(is_name(v) && is_node_id(v), "{v}");
        }
    }
}
