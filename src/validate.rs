//! Validation of every user-supplied name that becomes part of a Redis key.
//!
//! Names are checked before any key is built from them, so a key can never
//! contain a brace (which would change its Cluster hash slot), a colon (which
//! would let one name impersonate another key's structure) or whitespace.
//! Names also become URL path segments (`/api/v1/queues/{queue}`, dashboard
//! links), so `.` and `..` are refused: clients remove such dot segments
//! (RFC 3986, section 5.2.4), and a thing named so could never be addressed.

use crate::error::ApiError;

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
    (1..=64).contains(&s.len()) && charset_ok(s) && !dot_segment(s)
}

/// Queue, group, alias, barrier, lock and schedule names:
/// `[A-Za-z0-9._-]{1,128}`, not `.` or `..`.
pub fn is_name(s: &str) -> bool {
    (1..=128).contains(&s.len()) && charset_ok(s) && !dot_segment(s)
}

/// The 400 for a name that is only dots.
fn dot_segment_error(field: &str, value: &str) -> ApiError {
    ApiError::bad_request(format!(
        "`{field}` cannot be {value:?}: URLs drop `.` and `..` path segments, so it could not be addressed; \
         pick a name with another character"
    ))
}

/// Returns a 400 naming the field when `value` is not a valid node id.
pub fn node_id(field: &str, value: &str) -> Result<(), ApiError> {
    if is_node_id(value) {
        Ok(())
    } else if dot_segment(value) {
        Err(dot_segment_error(field, value))
    } else {
        Err(ApiError::bad_request(format!(
            "`{field}` must be 1 to 64 characters from A-Z a-z 0-9 . _ - (got {})",
            shorten(value)
        )))
    }
}

/// Returns a 400 naming the field when `value` is not a valid name.
pub fn name(field: &str, value: &str) -> Result<(), ApiError> {
    if is_name(value) {
        Ok(())
    } else if dot_segment(value) {
        Err(dot_segment_error(field, value))
    } else {
        Err(ApiError::bad_request(format!(
            "`{field}` must be 1 to 128 characters from A-Z a-z 0-9 . _ - (got {})",
            shorten(value)
        )))
    }
}

/// Idempotency keys and similar opaque tokens: 1 to 200 printable ASCII characters.
pub fn opaque_key(field: &str, value: &str) -> Result<(), ApiError> {
    if (1..=200).contains(&value.len()) && value.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "`{field}` must be 1 to 200 printable ASCII characters without spaces"
        )))
    }
}

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
