//! Which strings are names. A name becomes part of a Redis key and a URL
//! path segment, so it is `[A-Za-z0-9._-]`, bounded, and never `.` or `..`
//! (URL clients remove such dot segments, RFC 3986 section 5.2.4).

use serde::{Deserialize, Serialize};

use crate::bounds::{ID_LEN, NAME_MAX_LEN, NODE_ID_MAX_LEN};

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

/// Flow-control limit names: a name (`payments-api`), a template's key
/// (`tenant:acme`) or a template (`tenant:*`), each part a name.
pub fn is_limit_name(s: &str) -> bool {
    match s.split_once(':') {
        None => is_name(s),
        Some((base, key)) => is_name(base) && (key == "*" || is_name(key)),
    }
}

/// Whether limit name `s` is a template (`name:*`).
pub fn is_limit_template(s: &str) -> bool {
    s.ends_with(":*")
}

/// Task and workflow ids: 26 ASCII letters and digits (ULIDs).
pub fn is_id(s: &str) -> bool {
    s.len() == ID_LEN && s.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// A string that is not what its type requires; says what it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotA {
    /// What was expected: `a name`, `a node id`, `an id`.
    pub expected: &'static str,
    /// What the rule is, for a person.
    pub rule: &'static str,
}

impl std::fmt::Display for NotA {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not {}: {}", self.expected, self.rule)
    }
}

impl std::error::Error for NotA {}

macro_rules! checked_string {
    ($(#[$doc:meta])* $t:ident, $check:path, $expected:literal, $rule:literal) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $t(String);

        impl $t {
            /// The string, checked.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The string itself.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl TryFrom<String> for $t {
            type Error = NotA;
            fn try_from(s: String) -> Result<Self, NotA> {
                if $check(&s) {
                    Ok($t(s))
                } else {
                    Err(NotA {
                        expected: $expected,
                        rule: $rule,
                    })
                }
            }
        }

        impl TryFrom<&str> for $t {
            type Error = NotA;
            fn try_from(s: &str) -> Result<Self, NotA> {
                $t::try_from(s.to_string())
            }
        }

        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.0
            }
        }

        impl std::ops::Deref for $t {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $t {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::borrow::Borrow<str> for $t {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $t {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $t {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

checked_string!(
    /// A queue, group, alias, barrier, round, lock, election or schedule
    /// name: `[A-Za-z0-9._-]{1,128}`, not `.` or `..` ([`is_name`]).
    Name,
    is_name,
    "a name",
    "1 to 128 characters from A-Z a-z 0-9 . _ -, not `.` or `..`"
);

checked_string!(
    /// A flow-control limit: `name`, a template's key `name:key`, or a
    /// template `name:*` ([`is_limit_name`]).
    LimitName,
    is_limit_name,
    "a limit name",
    "a name, `name:key` or `name:*`, each part 1 to 128 characters from A-Z a-z 0-9 . _ -"
);

checked_string!(
    /// A node or worker id: `[A-Za-z0-9._-]{1,64}`, not `.` or `..`
    /// ([`is_node_id`]).
    NodeId,
    is_node_id,
    "a node id",
    "1 to 64 characters from A-Z a-z 0-9 . _ -, not `.` or `..`"
);

checked_string!(
    /// A task or workflow id: 26 ASCII letters and digits ([`is_id`]).
    TaskId,
    is_id,
    "an id",
    "26 ASCII letters and digits"
);

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
    use super::{Name, NodeId, TaskId, generated_node_id, is_name, is_node_id};

    #[test]
    fn checked_strings_take_only_what_their_rule_allows() {
        assert_eq!(Name::try_from("emails").unwrap().as_str(), "emails");
        assert!(Name::try_from("a b").is_err() && Name::try_from("..").is_err());
        let err = NodeId::try_from("x".repeat(65)).unwrap_err().to_string();
        assert!(err.starts_with("not a node id: 1 to 64"), "{err}");
        assert!(TaskId::try_from("01ARZ3NDEKTSV4RRFFQ69G5FAV").is_ok());
        assert!(TaskId::try_from("01ARZ3NDEKTSV4RRFFQ69G5FA").is_err());
        let n: Name = serde_json::from_str("\"q-1\"").unwrap();
        assert_eq!(serde_json::to_string(&n).unwrap(), "\"q-1\"");
        assert!(serde_json::from_str::<Name>("\"q 1\"").is_err());
    }

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
