//! Latency percentiles of the benchmarks, one definition for all of them.

use serde::Serialize;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub samples: usize,
}

impl Latency {
    /// The nearest-rank percentiles of `v` (ms); zeros when it is empty.
    pub(crate) fn of(mut v: Vec<f64>) -> Latency {
        if v.is_empty() {
            return Latency::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let q = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
        Latency {
            p50_ms: q(0.50),
            p99_ms: q(0.99),
            max_ms: v[v.len() - 1],
            samples: v.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Latency;

    #[test]
    fn nearest_rank() {
        let l = Latency::of((1..=100).map(f64::from).collect());
        assert_eq!((l.p50_ms, l.p99_ms, l.max_ms, l.samples), (50.0, 99.0, 100.0, 100));
        assert_eq!(Latency::of(Vec::new()).samples, 0);
    }
}
