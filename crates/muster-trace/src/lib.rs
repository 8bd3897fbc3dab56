//! Tracing for muster (issue 39): the W3C trace context a task carries from
//! its submit to its last attempt, the spans the node and the workers make,
//! and the exporter that sends them over OTLP/HTTP (protobuf).
//!
//! No OpenTelemetry SDK: the node records a handful of span kinds at known
//! points, so a span is a plain value ([`Span`]) handed to a bounded queue
//! ([`Exporter::record`] never waits: a full queue drops and counts), and a
//! background task encodes batches by hand ([`otlp`], the few messages of
//! `opentelemetry/proto/collector/trace/v1`) and posts them. A receiver that
//! is down costs the dropped spans, counted, and nothing else.

mod context;
mod export;
pub mod otlp;

pub use context::{SpanContext, TRACESTATE_MAX, valid_tracestate};
pub use export::{ExportConfig, ExportStats, Exporter};
pub use otlp::{Event, Kind, Span, Value};

/// The time now, in nanoseconds since the Unix epoch (span times are the
/// recording process's clock, as OTLP defines them).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Whether a new trace is sampled at `ratio` (0.0 to 1.0), decided by its id
/// alone so that every process decides the same for the same trace (the
/// `TraceIdRatioBased` rule: the id's low 8 bytes against the ratio).
pub fn sampled_by_ratio(trace_id: &[u8; 16], ratio: f64) -> bool {
    if ratio >= 1.0 {
        return true;
    }
    if ratio.is_nan() || ratio <= 0.0 {
        return false;
    }
    let mut low = [0u8; 8];
    low.copy_from_slice(&trace_id[8..]);
    let x = u64::from_be_bytes(low) >> 1;
    x < (ratio * (1u64 << 63) as f64) as u64
}

#[cfg(test)]
mod tests {
    use super::sampled_by_ratio;

    #[test]
    fn the_ratio_samples_about_that_share_of_ids() {
        let mut hit = 0;
        for i in 0u64..10_000 {
            let mut id = [0u8; 16];
            id[8..].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_be_bytes());
            if sampled_by_ratio(&id, 0.25) {
                hit += 1;
            }
        }
        assert!((2_200..2_800).contains(&hit), "{hit} of 10 000 sampled at 0.25");
        assert!(sampled_by_ratio(&[7; 16], 1.0));
        assert!(!sampled_by_ratio(&[7; 16], 0.0));
        assert!(!sampled_by_ratio(&[7; 16], f64::NAN));
    }
}
