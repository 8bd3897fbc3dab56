//! Which strings are names. A name becomes part of a Redis key and a URL
//! path segment, so it is `[A-Za-z0-9._-]`, bounded, and never `.` or `..`
//! (URL clients remove such dot segments, RFC 3986 section 5.2.4).

use crate::bounds::{NAME_MAX_LEN, NODE_ID_MAX_LEN};

fn charset_ok(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// `.` and `..`: path segments that URL clients remove.
pub fn is_dot_segment(s: &str) -> bool {
    s == "." || s == ".."
}

/// Node ids: `[A-Za-z0-9._-]{1,64}`, not `.` or `..`.
pub fn is_node_id(s: &str) -> bool {
    (1..=NODE_ID_MAX_LEN).contains(&s.len()) && charset_ok(s) && !is_dot_segment(s)
}

/// Queue, group, alias, barrier, lock and schedule names:
/// `[A-Za-z0-9._-]{1,128}`, not `.` or `..`.
pub fn is_name(s: &str) -> bool {
    (1..=NAME_MAX_LEN).contains(&s.len()) && charset_ok(s) && !is_dot_segment(s)
}

/// `<hostname>-<ulid suffix>`, within the node id charset and length: the id
/// a node or worker takes when none is configured.
pub fn generated_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_else(|_| "node".into());
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let host = if host.is_empty() { "node".to_string() } else { host };
    let ulid = ulid::Ulid::generate().to_string().to_lowercase();
    format!("{host}-{}", &ulid[ulid.len() - 8..])
}

#[cfg(test)]
mod tests {
    use super::{generated_node_id, is_name, is_node_id};

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
        for v in [".", ".."] {
            assert!(!is_name(v) && !is_node_id(v), "{v}");
        }
        for v in ["...", ".a", "a.", "..b", "a..b"] {
            assert!(is_name(v) && is_node_id(v), "{v}");
        }
    }

    #[test]
    fn a_generated_node_id_is_a_node_id() {
        let id = generated_node_id();
        assert!(is_node_id(&id), "{id}");
        assert_ne!(id, generated_node_id());
    }
}
