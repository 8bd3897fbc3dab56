//! Decoding of script replies whose elements mix integers and strings (Lua
//! tables become arrays of either). A short or odd reply decodes as absent
//! values, never a panic.

use redis::Value;

/// An integer element (also from a numeric string or a double).
pub fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        Value::BulkString(b) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
        Value::SimpleString(s) => s.parse().unwrap_or(0),
        Value::Double(d) => *d as i64,
        _ => 0,
    }
}

/// A string element (integers are formatted; nil is empty).
pub fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Okay => "OK".into(),
        _ => String::new(),
    }
}

/// The i-th element of a reply, or Nil.
pub fn at(reply: &[Value], i: usize) -> &Value {
    reply.get(i).unwrap_or(&Value::Nil)
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
}
