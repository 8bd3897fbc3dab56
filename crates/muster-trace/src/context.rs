//! The W3C trace context (<https://www.w3.org/TR/trace-context/>): the
//! `traceparent` a caller sends, stored with a task and handed to its
//! worker, and the `tracestate` that travels beside it unread.

use rand::Rng;

/// The longest `tracestate` kept (the W3C limit: 32 members of at most 256
/// characters each, but "vendors SHOULD propagate at least 512 characters").
/// A longer one is refused on submit.
pub const TRACESTATE_MAX: usize = 512;

/// One span's identity within its trace, as a `traceparent` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The `sampled` flag: whether the spans of this trace are recorded.
    pub sampled: bool,
}

impl SpanContext {
    /// Reads a `traceparent` header: `00-<32 hex>-<16 hex>-<2 hex>`, lower
    /// case, neither id all zeros. A later version is read by its first four
    /// fields, as the recommendation asks; version `ff` is invalid.
    pub fn parse(header: &str) -> Option<SpanContext> {
        let s = header.trim();
        let b = s.as_bytes();
        if b.len() < 55 {
            return None;
        }
        let version = hex_byte(&b[0..2])?;
        if version == 0xff || (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, out) in trace_id.iter_mut().enumerate() {
            *out = hex_byte(&b[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, out) in span_id.iter_mut().enumerate() {
            *out = hex_byte(&b[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&b[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(SpanContext {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// A new trace's first span.
    pub fn root(sampled: bool) -> SpanContext {
        let mut rng = rand::rng();
        let mut trace_id = [0u8; 16];
        while trace_id == [0; 16] {
            rng.fill(&mut trace_id);
        }
        SpanContext {
            trace_id,
            span_id: new_span_id(),
            sampled,
        }
    }

    /// A new span in this span's trace (its child, when recorded with this
    /// span as the parent).
    pub fn child(&self) -> SpanContext {
        SpanContext {
            span_id: new_span_id(),
            ..*self
        }
    }

    /// The `traceparent` header naming this span.
    pub fn traceparent(&self) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &self.span_id);
        s.push_str(if self.sampled { "-01" } else { "-00" });
        s
    }

    /// The trace id as 32 lower-case hex digits (what trace viewers show).
    pub fn trace_id_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        push_hex(&mut s, &self.trace_id);
        s
    }
}

/// Whether a `tracestate` header may be stored and passed on: at most
/// [`TRACESTATE_MAX`] characters, printable ASCII (the W3C grammar's
/// alphabet; its finer rules are the vendors' business, not ours).
pub fn valid_tracestate(s: &str) -> bool {
    s.len() <= TRACESTATE_MAX && s.bytes().all(|c| (0x20..0x7f).contains(&c))
}

fn new_span_id() -> [u8; 8] {
    let mut rng = rand::rng();
    let mut id = [0u8; 8];
    while id == [0; 8] {
        rng.fill(&mut id);
    }
    id
}

fn hex_byte(two: &[u8]) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(two[0])? << 4 | d(two[1])?)
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::{SpanContext, valid_tracestate};

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_and_writes_back_the_same() {
        let c = SpanContext::parse(TP).expect("the W3C example");
        assert!(c.sampled);
        assert_eq!(c.traceparent(), TP);
        assert_eq!(c.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        let child = c.child();
        assert_eq!(child.trace_id, c.trace_id);
        assert_ne!(child.span_id, c.span_id);
    }

    #[test]
    fn malformed_traceparents_are_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(SpanContext::parse(bad), None, "{bad:?}");
        }
        // A later version with more fields is read by its first four.
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes";
        assert!(!SpanContext::parse(later).expect("a later version").sampled);
    }

    #[test]
    fn tracestate_is_bounded_and_printable() {
        assert!(valid_tracestate("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"));
        assert!(!valid_tracestate(&"a".repeat(513)));
        assert!(!valid_tracestate("a=b\nc=d"));
    }
}
