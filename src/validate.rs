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

// The bounds are the single source of both the checks in handlers and the
// OpenAPI document (`crate::openapi` writes them into the schemas), and of
// the clients' clamps: they live in the contract crate.
pub(crate) use muster_api::bounds::*;
use muster_api::names::is_dot_segment as dot_segment;
pub(crate) use muster_api::names::{is_name, is_node_id};

/// The 400 for a name that is only dots.
fn dot_segment_error(field: &str, value: &str) -> Invalid {
    Invalid::new(format!(
        "`{field}` cannot be {value:?}: URLs drop `.` and `..` path segments, so it could not be addressed; \
         pick a name with another character"
    ))
}

/// Returns a 400 naming the field when `value` is not a valid node id.
pub(crate) fn node_id(field: &str, value: &str) -> Result<(), Invalid> {
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
pub(crate) fn name(field: &str, value: &str) -> Result<(), Invalid> {
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
pub(crate) fn opaque_key(field: &str, value: &str) -> Result<(), Invalid> {
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
pub(crate) fn is_hidden_char(c: char) -> bool {
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
pub(crate) fn plain_text(field: &str, value: &str) -> Result<(), Invalid> {
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
pub(crate) fn id(what: &str, value: &str) -> Result<(), Invalid> {
    if value.len() == ID_LEN && value.bytes().all(|b| b.is_ascii_alphanumeric()) {
        Ok(())
    } else {
        Err(Invalid::new(format!(
            "`id` must be a {ID_LEN}-character {what} id (got {})",
            shorten(value)
        )))
    }
}

/// A list of flow-control limits a queue or a task names (G13): up to
/// `TASK_LIMITS_MAX` (and at least `least`), each a limit or a template's
/// key (a template `name:*` binds nothing by itself), none twice.
pub(crate) fn limit_list(field: &str, limits: &[String], least: usize) -> Result<(), Invalid> {
    if !(least..=TASK_LIMITS_MAX).contains(&limits.len()) {
        return Err(Invalid::new(format!(
            "`{field}` names {least} to {TASK_LIMITS_MAX} limits (got {})",
            limits.len()
        )));
    }
    for (i, l) in limits.iter().enumerate() {
        if !muster_api::is_limit_name(l) || muster_api::is_limit_template(l) {
            return Err(Invalid::new(format!(
                "`{field}[{i}]` must be a limit name or a template's key `name:key`, each part 1 to \
                 {NAME_MAX_LEN} characters from A-Z a-z 0-9 . _ - (a template `name:*` binds nothing by itself)"
            )));
        }
        if limits[..i].contains(l) {
            return Err(Invalid::new(format!("`{field}` names `{l}` twice")));
        }
    }
    Ok(())
}

/// Returns a 400 naming the field unless `range` holds `value`.
pub(crate) fn in_range<T: PartialOrd + std::fmt::Display>(
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
pub(crate) fn shorten(value: &str) -> String {
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
