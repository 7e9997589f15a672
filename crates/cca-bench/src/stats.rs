//! Summary statistics of a set of latencies: mean, nearest-rank
//! percentiles and max, in seconds.

use std::time::Duration;

use serde::Serialize;

/// Mean, P50, P95, P99 and max of some latencies, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    pub mean: f64,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Summarises `latencies` (all zero when there are none).
    pub fn of(mut latencies: Vec<Duration>) -> Self {
        if latencies.is_empty() {
            return Self::default();
        }
        latencies.sort_unstable();
        let total: f64 = latencies.iter().map(Duration::as_secs_f64).sum();
        Self {
            mean: total / latencies.len() as f64,
            p50: percentile(&latencies, 50.0),
            p95: percentile(&latencies, 95.0),
            p99: percentile(&latencies, 99.0),
            max: latencies.last().map_or(0.0, Duration::as_secs_f64),
        }
    }
}

/// Nearest-rank percentile of sorted, non-empty latencies.
fn percentile(sorted: &[Duration], percent: f64) -> f64 {
    let rank = (percent / 100.0 * sorted.len() as f64).ceil() as usize;
    let index = rank.clamp(1, sorted.len()) - 1;
    sorted[index].as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let latencies = (1..=100).map(Duration::from_secs).collect();
        let summary = Summary::of(latencies);
        assert_eq!(
            (summary.p50, summary.p95, summary.p99, summary.max),
            (50.0, 95.0, 99.0, 100.0)
        );
        assert!((summary.mean - 50.5).abs() < 1e-9);
        assert_eq!(Summary::of(Vec::new()), Summary::default());
    }
}
