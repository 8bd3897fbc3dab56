//! Spans, and their OTLP encoding: an `ExportTraceServiceRequest`
//! (`opentelemetry/proto/collector/trace/v1/trace_service.proto`) written
//! field by field in the protobuf wire format. Only what muster records is
//! written: resource attributes, one instrumentation scope, and spans with
//! attributes, events and a status.
//!
//! Field numbers (from `trace/v1/trace.proto`, `common/v1/common.proto`,
//! `resource/v1/resource.proto`):
//! request 1 resource_spans; ResourceSpans 1 resource, 2 scope_spans;
//! Resource 1 attributes; ScopeSpans 1 scope, 2 spans; scope 1 name,
//! 2 version; Span 1 trace_id, 2 span_id, 3 trace_state, 4 parent_span_id,
//! 5 name, 6 kind, 7 start (fixed64), 8 end (fixed64), 9 attributes,
//! 11 events, 13 links, 15 status; Link 1 trace_id, 2 span_id; Event 1 time (fixed64), 2 name, 3 attributes;
//! Status 2 message, 3 code; KeyValue 1 key, 2 value; AnyValue 1 string,
//! 2 bool, 3 int, 4 double.

use std::borrow::Cow;

/// What a span stands for (OTLP's `SpanKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
    Producer = 4,
    Consumer = 5,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Str(Cow<'static, str>),
    Bool(bool),
    Int(i64),
    F64(f64),
}

impl From<&'static str> for Value {
    fn from(s: &'static str) -> Value {
        Value::Str(Cow::Borrowed(s))
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::Str(Cow::Owned(s))
    }
}
impl From<i64> for Value {
    fn from(n: i64) -> Value {
        Value::Int(n)
    }
}
impl From<u64> for Value {
    fn from(n: u64) -> Value {
        Value::Int(n.min(i64::MAX as u64) as i64)
    }
}
impl From<u32> for Value {
    fn from(n: u32) -> Value {
        Value::Int(n.into())
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::Bool(b)
    }
}

pub type Attrs = Vec<(&'static str, Value)>;

/// A time-stamped note on a span.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub time_ns: u64,
    pub name: &'static str,
    pub attrs: Attrs,
}

/// One finished span.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub trace_state: String,
    pub name: Cow<'static, str>,
    pub kind: Kind,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attrs: Attrs,
    pub events: Vec<Event>,
    /// Spans this one is about without being their child (a batch's
    /// receive span and the messages it received): trace id, span id.
    pub links: Vec<([u8; 16], [u8; 8])>,
    /// `Some(message)`: the span failed (status ERROR with that message).
    pub error: Option<String>,
}

impl Span {
    /// A span of `ctx` (its ids), child of `parent` when given.
    pub fn new(
        ctx: &crate::SpanContext,
        parent: Option<&crate::SpanContext>,
        name: impl Into<Cow<'static, str>>,
        kind: Kind,
        start_ns: u64,
    ) -> Span {
        Span {
            trace_id: ctx.trace_id,
            span_id: ctx.span_id,
            parent_span_id: parent.map(|p| p.span_id),
            trace_state: String::new(),
            name: name.into(),
            kind,
            start_ns,
            end_ns: start_ns,
            attrs: Vec::new(),
            events: Vec::new(),
            links: Vec::new(),
            error: None,
        }
    }

    pub fn attr(mut self, key: &'static str, value: impl Into<Value>) -> Span {
        self.attrs.push((key, value.into()));
        self
    }

    /// About how many bytes the span takes encoded (for batch sizes).
    pub fn size_hint(&self) -> usize {
        80 + self.name.len()
            + self.trace_state.len()
            + self.attrs.len() * 40
            + self.events.len() * 60
            + self.links.len() * 30
    }
}

/// Encodes one export request: the spans under one resource (its
/// attributes, `service.name` first) and one instrumentation scope.
pub fn encode_request(resource: &[(&str, &str)], scope: (&str, &str), spans: &[Span]) -> Vec<u8> {
    let mut res = Vec::new();
    for (k, v) in resource {
        let mut kv = Vec::new();
        string(&mut kv, 1, k);
        let mut any = Vec::new();
        string(&mut any, 1, v);
        message(&mut kv, 2, &any);
        message(&mut res, 1, &kv);
    }
    let mut scope_spans = Vec::new();
    let mut sc = Vec::new();
    string(&mut sc, 1, scope.0);
    string(&mut sc, 2, scope.1);
    message(&mut scope_spans, 1, &sc);
    let mut buf = Vec::new();
    for s in spans {
        buf.clear();
        encode_span(&mut buf, s);
        message(&mut scope_spans, 2, &buf);
    }
    let mut rs = Vec::new();
    message(&mut rs, 1, &res);
    message(&mut rs, 2, &scope_spans);
    let mut out = Vec::with_capacity(rs.len() + 8);
    message(&mut out, 1, &rs);
    out
}

fn encode_span(out: &mut Vec<u8>, s: &Span) {
    bytes(out, 1, &s.trace_id);
    bytes(out, 2, &s.span_id);
    if !s.trace_state.is_empty() {
        string(out, 3, &s.trace_state);
    }
    if let Some(p) = &s.parent_span_id {
        bytes(out, 4, p);
    }
    string(out, 5, &s.name);
    varint_field(out, 6, s.kind as u64);
    fixed64(out, 7, s.start_ns);
    fixed64(out, 8, s.end_ns.max(s.start_ns));
    attrs(out, 9, &s.attrs);
    for e in &s.events {
        let mut ev = Vec::new();
        fixed64(&mut ev, 1, e.time_ns);
        string(&mut ev, 2, e.name);
        attrs(&mut ev, 3, &e.attrs);
        message(out, 11, &ev);
    }
    for (trace_id, span_id) in &s.links {
        let mut link = Vec::with_capacity(30);
        bytes(&mut link, 1, trace_id);
        bytes(&mut link, 2, span_id);
        message(out, 13, &link);
    }
    let mut st = Vec::new();
    match &s.error {
        Some(msg) => {
            string(&mut st, 2, msg);
            varint_field(&mut st, 3, 2);
        }
        None => varint_field(&mut st, 3, 0),
    }
    message(out, 15, &st);
}

fn attrs(out: &mut Vec<u8>, field: u32, attrs: &Attrs) {
    for (k, v) in attrs {
        let mut kv = Vec::new();
        string(&mut kv, 1, k);
        let mut any = Vec::new();
        match v {
            Value::Str(s) => string(&mut any, 1, s),
            Value::Bool(b) => varint_field(&mut any, 2, *b as u64),
            Value::Int(n) => varint_field(&mut any, 3, *n as u64),
            Value::F64(x) => {
                key(&mut any, 4, 1);
                any.extend_from_slice(&x.to_le_bytes());
            }
        }
        message(&mut kv, 2, &any);
        message(out, field, &kv);
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    key(out, field, 0);
    varint(out, v);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    key(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    key(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    bytes(out, field, s.as_bytes());
}

fn message(out: &mut Vec<u8>, field: u32, m: &[u8]) {
    bytes(out, field, m);
}

#[cfg(test)]
mod tests {
    use super::{Kind, Span, encode_request, varint};
    use crate::SpanContext;

    #[test]
    fn varints_are_little_endian_base_128() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        v.clear();
        varint(&mut v, u64::MAX);
        assert_eq!(v.len(), 10);
    }

    #[test]
    fn a_request_nests_resource_scope_and_span() {
        let ctx = SpanContext::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let span = Span::new(&ctx, None, "send q", Kind::Producer, 1).attr("messaging.system", "muster");
        let out = encode_request(&[("service.name", "muster")], ("muster", "0.1.0"), &[span]);
        // resource_spans (field 1, length-delimited) holds everything.
        assert_eq!(out[0], 0x0a);
        let has = |needle: &[u8]| out.windows(needle.len()).any(|w| w == needle);
        assert!(has(&ctx.trace_id), "the trace id is written");
        assert!(has(b"send q") && has(b"messaging.system") && has(b"service.name"));
        // The kind: field 6, varint 4 (PRODUCER).
        assert!(has(&[0x30, 0x04]));
    }
}
