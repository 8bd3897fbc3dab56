//! Decoding of script replies whose elements mix integers and strings (Lua
//! tables become arrays of either).
//!
//! [`Reader`] walks a reply element by element for the typed reply of each
//! script (`FromRedisValue` impls next to the script's argument struct): a
//! reply that is shorter or shaped otherwise than its script's header says is
//! a decode error (a bug, answered 500), never a silent default. The loose
//! helpers [`int`], [`text`] and [`at`] remain for replies read in bulk.

use redis::{ParsingError, Value};

use super::codes::Code;

/// An integer element (also from a numeric string or a double).
pub(crate) fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
        Value::SimpleString(s) => s.parse().unwrap_or(0),
        Value::Double(d) => *d as i64,
        _ => 0,
    }
}

/// A string element (integers are formatted; nil is empty).
pub(crate) fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Okay => "OK".into(),
        _ => String::new(),
    }
}

/// The i-th element of a reply, or Nil.
pub(crate) fn at(reply: &[Value], i: usize) -> &Value {
    reply.get(i).unwrap_or(&Value::Nil)
}

/// A decode error naming what was expected.
pub(crate) fn decode_error(what: impl Into<String>) -> ParsingError {
    ParsingError::from(format!("unexpected script reply: {}", what.into()))
}

type Decoded<T> = Result<T, ParsingError>;

/// Reads a script's array reply in order.
/// Decodes a whole reply with a [`Reader`]: the body of every script
/// reply's `FromRedisValue`.
pub(crate) fn read<T>(
    v: &Value,
    f: impl FnOnce(&mut Reader<'_>) -> Result<T, ParsingError>,
) -> Result<T, ParsingError> {
    f(&mut Reader::new(v))
}

pub(crate) struct Reader<'a> {
    items: &'a [Value],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader over an array reply (a scalar reads as a one-element array).
    pub(crate) fn new(v: &'a Value) -> Reader<'a> {
        match v {
            Value::Array(items) => Reader { items, pos: 0 },
            other => Reader {
                items: std::slice::from_ref(other),
                pos: 0,
            },
        }
    }

    fn next(&mut self, what: &str) -> Decoded<&'a Value> {
        let v = self
            .items
            .get(self.pos)
            .ok_or_else(|| decode_error(format!("the reply ends before {what} (element {})", self.pos)))?;
        self.pos += 1;
        Ok(v)
    }

    /// An integer element.
    pub(crate) fn int(&mut self, what: &str) -> Decoded<i64> {
        match self.next(what)? {
            Value::Int(i) => Ok(*i),
            Value::BulkString(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| decode_error(format!("{what} is not an integer"))),
            Value::Double(d) => Ok(*d as i64),
            other => Err(decode_error(format!("{what} is not an integer: {other:?}"))),
        }
    }

    /// A string element (an integer reads as its decimal text; nil as "").
    pub(crate) fn text(&mut self, what: &str) -> Decoded<String> {
        match self.next(what)? {
            Value::Nil => Ok(String::new()),
            v @ (Value::BulkString(_) | Value::SimpleString(_) | Value::Int(_) | Value::Okay) => Ok(text(v)),
            other => Err(decode_error(format!("{what} is not a string: {other:?}"))),
        }
    }

    /// A nested array element.
    pub(crate) fn array(&mut self, what: &str) -> Decoded<Reader<'a>> {
        match self.next(what)? {
            Value::Array(items) => Ok(Reader { items, pos: 0 }),
            other => Err(decode_error(format!("{what} is not an array: {other:?}"))),
        }
    }

    /// A script's leading code: its own outcome when non-negative, else one
    /// of the shared [`Code`]s.
    pub(crate) fn code(&mut self) -> Decoded<Result<i64, Code>> {
        let c = self.int("the code")?;
        if c >= 0 {
            return Ok(Ok(c));
        }
        Code::from_i64(c)
            .map(Err)
            .ok_or_else(|| decode_error(format!("unknown code {c}")))
    }

    /// Elements not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.items.len().saturating_sub(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_mixed_replies() {
        let r = vec![
            Value::Int(3),
            Value::BulkString(b"42".to_vec()),
            Value::BulkString(b"x".to_vec()),
        ];
        assert_eq!(int(at(&r, 0)), 3);
        assert_eq!(int(at(&r, 1)), 42);
        assert_eq!(text(at(&r, 2)), "x");
        assert_eq!(text(at(&r, 9)), "");
        assert_eq!(int(at(&r, 9)), 0);
    }

    #[test]
    fn a_reader_fails_on_short_or_mistyped_replies() {
        let v = Value::Array(vec![Value::Int(-2), Value::BulkString(b"x".to_vec())]);
        let mut r = Reader::new(&v);
        assert_eq!(r.code().unwrap(), Err(Code::Stale));
        assert!(r.int("a number").is_err());
        assert!(r.text("more").is_err());
        let v = Value::Array(vec![Value::Int(-999)]);
        assert!(Reader::new(&v).code().is_err());
        let v = Value::Int(2);
        assert_eq!(Reader::new(&v).code().unwrap(), Ok(2));
    }
}

/// Helpers for the script layers' unit tests: reply values, and the counts
/// of `KEYS` and `ARGV` a script's header documents.
#[cfg(test)]
pub(crate) mod testing {
    use redis::Value;

    use crate::store::{Keys, ScriptCall};

    pub(crate) fn int(i: i64) -> Value {
        Value::Int(i)
    }

    pub(crate) fn s(t: &str) -> Value {
        Value::BulkString(t.as_bytes().to_vec())
    }

    pub(crate) fn arr(v: Vec<Value>) -> Value {
        Value::Array(v)
    }

    /// The number of `-- KEYS[n]` and `-- ARGV[n]` lines of a script header.
    pub(crate) fn header(src: &str) -> (usize, usize) {
        let count = |what: &str| src.lines().filter(|l| l.starts_with(&format!("-- {what}["))).count();
        (count("KEYS"), count("ARGV"))
    }

    /// Asserts that `call` passes the keys and arguments `src`'s header documents.
    pub(crate) fn check(call: &impl ScriptCall, src: &str) {
        check_with_extra(call, src, 0);
    }

    /// As [`check`], for a call that adds `extra` arguments after the
    /// documented ones (a variable part, such as n field/value pairs).
    pub(crate) fn check_with_extra(call: &impl ScriptCall, src: &str, extra: usize) {
        let k = Keys::new("muster");
        let (keys, args) = header(src);
        assert_eq!(
            (call.keys(&k).len(), call.args().len()),
            (keys, args + extra),
            "{}",
            src.lines().next().unwrap()
        );
    }
}
